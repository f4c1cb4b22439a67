"""Identity dynamics: the state (T, s, shock statistics) and its update, the Shock signal, one turn."""
