def get_encoding(name):
    raise ConnectionError(f"Max retries exceeded downloading the BPE file of {name!r} (offline)")
