import sys

from simpar.cli.parser import main

sys.exit(main())
