"""The fast path: the same BERT arithmetic on real tokens only (packing, attention kernels, GEMM
backends, the packed encoder), token-budget batching, and the resumable embedding job."""
