"""The peers of ``bench.micro.peer``: each serves the same graph as ``qpart serve``'s ``/v2`` infer
route, from its own virtualenv (:mod:`bench.micro.peers.venvs`), through
:mod:`bench.micro.peers.graph`. The model files run inside the peers' processes, with the peers'
own Python: ``triton_model`` (Triton's Python backend), ``pytriton_serve`` (PyTriton) and
``litserve_model`` (LitServe); KServe's is :mod:`bench.micro.kserve_model`."""
