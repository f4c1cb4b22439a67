from sia.cli import main

raise SystemExit(main())
