from verispec.serve.cli import main

raise SystemExit(main())
