import os

import pytest

os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


@pytest.fixture(params=["inprocess", "ucx"])
def transport_name(request):
    return request.param
