"""The DDP example lives in the package (fleetlens/examples/ddp_train.py) so `fleetlens demo`
can run it from an installed copy; this file lets it be run from a checkout as before:

    torchrun --standalone --nproc-per-node 4 examples/ddp_train.py --steps 40 --slow-rank 2
"""

from fleetlens.examples.ddp_train import main

if __name__ == "__main__":
    main()
