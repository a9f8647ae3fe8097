"""Plain code the test folders share: builders of test inputs and small checks, imported by
name (``from tests.support.video import make_video``). Nothing here starts a resource: servers,
Redis and transformers models are fixtures in the ``conftest.py`` of the folder that uses them."""
