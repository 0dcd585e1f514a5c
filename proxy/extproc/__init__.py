"""The gate as Envoy's External Processor (ext_proc, over gRPC): a front beside the HTTP one."""
