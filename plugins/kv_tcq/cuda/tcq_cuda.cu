/* kv_tcq on the cuda backend: not written yet (the codecs list cpu only until it is) */
