"""The runtime: the services the HTTP routes and the command line call, built once over one model and one store.

``services.py`` builds them: ``personas.py`` (personas and their defaults), ``identities.py`` (reading and
administering identity state), ``turns.py`` (the turn: hold, load, run, commit; and the counterfactual),
``serving.py`` (turns seen from the event loop: worker threads, the limiter, metrics), ``keys.py`` (API keys
and who a request acts as), ``health.py`` (readiness). ``inputs.py`` checks what a request may carry and
``codec.py`` turns states into the blobs the store keeps and back.
"""
