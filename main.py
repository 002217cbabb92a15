"""nvfp4stack entry point: ``python main.py [-m] [key=value ...] <command>`` (see README.md)."""
from nvfp4stack.cli import main

if __name__ == "__main__":
    main()
