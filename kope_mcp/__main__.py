from kope_mcp.cli import main

raise SystemExit(main())
