from .registry import get_encoding


def encoding_for_model(model_name):
    return get_encoding("cl100k_base" if model_name.startswith("gpt-4") else "gpt2")
