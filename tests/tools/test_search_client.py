"""HTTP session set-up shared by the search, browse and judge clients."""


def test_tool_sessions_pool_enough_connections_for_concurrent_calls():
    """The registry calls a tool from 16 threads; a pool of 10 would discard connections."""
    from aepo_jax.tools.http_client import pooled_session

    adapter = pooled_session(pool_size=32).get_adapter("http://127.0.0.1:1/")
    assert adapter._pool_maxsize == 32
