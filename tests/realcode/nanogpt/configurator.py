"""Command-line configuration in nanoGPT's way, exec'd by train.py into its globals:

    python train.py config/tiny.py --batch_size=32 --compile=False

A bare argument is a config file run as Python; ``--key=value`` overrides one global, its value
read as a Python literal when it parses as one, else kept a string, and refused when its type
differs from the default's.
"""

import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        assert not arg.startswith("--"), f"{arg}: an override is --key=value"
        print(f"Overriding config with {arg}:")
        with open(arg) as f:
            print(f.read())
        with open(arg) as f:
            exec(f.read())
    else:
        assert arg.startswith("--"), f"{arg}: an override is --key=value"
        key, val = arg[2:].split("=", 1)
        if key not in globals():
            raise ValueError(f"Unknown config key: {key}")
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        if type(attempt) is not type(globals()[key]):
            raise TypeError(f"--{key}={val}: expected {type(globals()[key]).__name__}")
        print(f"Overriding: {key} = {attempt}")
        globals()[key] = attempt
