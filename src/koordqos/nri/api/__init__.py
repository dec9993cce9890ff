"""Generated protobuf code for NRI (nri_api_pb2) and the ttrpc envelopes (ttrpc_pb2); see `nox -s protos`."""
