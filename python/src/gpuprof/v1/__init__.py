"""gpuprof.v1, generated from proto/gpuprof/v1/gpuprof.proto by python/generate.sh.

``gpuprof_pb2`` has the messages (with type stubs), ``gpuprof_pb2_grpc`` the ``GpuprofStub``.
"""
