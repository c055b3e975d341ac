"""The fast path: the same BERT arithmetic on real tokens only (packing, attention kernels, GEMM
backends, the packed encoder), token-budget batching, the resumable embedding job and its input
reader, int8 (quant), the kernel choice measured per machine (tuning), glibc's heap settings."""
