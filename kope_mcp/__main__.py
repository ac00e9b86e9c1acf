from kope_mcp.app.cli import main

raise SystemExit(main())
