from sia.commands import main

raise SystemExit(main())
