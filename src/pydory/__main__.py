from pydory.cli import main

raise SystemExit(main())
