"""``python -m bench.e2e``: the benchmark's command line (:func:`bench.e2e.main`)."""

from __future__ import annotations

from bench.e2e import main

if __name__ == "__main__":
    main()
