from .cli.main import main

if __name__ == "__main__":  # spawned worker processes import this module as __mp_main__: do not run the CLI there
    main()
