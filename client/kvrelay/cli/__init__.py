"""The ``kvrelay`` command line: ``up``, ``worker``, ``generate``, ``chat``, ``bench``, ``models``.

Only the light client SDK is imported at start. Sub-commands that need the worker package
(``worker``, ``models``, ``up``) import ``kvrelay_worker`` lazily and say how to install it
when it is missing.
"""
