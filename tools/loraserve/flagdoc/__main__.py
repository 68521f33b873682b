"""`python -m loraserve.flagdoc README.md`: rewrites the README's flag tables."""

from loraserve.flagdoc import main

raise SystemExit(main())
