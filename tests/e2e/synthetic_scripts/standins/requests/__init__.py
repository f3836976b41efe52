"""Stand-in for requests (tests only): every download fails as it does offline."""


class ConnectionError(OSError):
    pass


def get(url, *args, **kwargs):
    raise ConnectionError(f"HTTPSConnectionPool: Max retries exceeded with url: {url} (offline)")
