"""The BentoML worker, process side: finding tritonserver, its command line, starting and
supervising it on loopback ports (restarts, stall and dead-stub watches), sharing one server
between workers, pairing the python stubs with a Python installation, and the gRPC client.
"""
