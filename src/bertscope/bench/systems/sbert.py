"""sentence-transformers' ``encode`` (batches of 32 sorted by length, as it does by default)."""

from __future__ import annotations

NAME = "sentence-transformers"
ORDER = 1
DEVICES = ("cpu", "cuda")


def build(setup):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(setup.folder), device=setup.device)
    st.max_seq_length = setup.max_len
    if setup.dtype is not None:
        st.to(setup.dtype)

    def run(texts):
        out = st.encode(list(texts), batch_size=32, convert_to_tensor=True,
                        normalize_embeddings=True, show_progress_bar=False)
        return out.float().cpu().numpy()  # (N, C); via float so bf16 converts too

    return run
