"""Generated code for the koord-runtime-proxy hook API (runtime.v1alpha1): runtime_api_pb2 (+ .pyi) and
runtime_api_grpc (grpclib stubs); regenerate with `python -m nox -s protos`."""
