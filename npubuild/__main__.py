import sys

from npubuild.cli import main

sys.exit(main())
