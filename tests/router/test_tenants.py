"""Tenants: the tenants file, the priority each may use, and the router's admission by tenant."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.errors import OverloadedError
from pdserve.validation import Limits
from pdserve.requests import Priority
from pdserve.rpc.drain import Drain
from pdserve.rpc.errors import PermissionDenied, Unauthenticated
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2 as pb
from router.doors.frontend import Frontend
from router.doors.gateway import Gateway, _Active
from router.doors.servicer import WireAsk
from router.doors.tenants import OverPriority, Tenant, TenantsFileError, open_tenants, read_tenants
from tests.router.fake_trace import FakeTrace

FILE = """
# token          settings
tok-acme         tenant=acme max_priority=vip max_concurrent=2
tok-batchco      tenant=batchco max_priority=batch over_priority=lower
tok-plain        # a bare token: tenant 'default', every class
"""


@pytest.fixture()
def tenants(tmp_path):
    path = tmp_path / "tenants"
    path.write_text(FILE)
    return read_tenants(str(path))


def test_the_tenants_file_names_tenants_by_token(tenants):
    assert tenants.resolve("Bearer tok-acme") == Tenant("acme", Priority.VIP, OverPriority.REFUSE, 2)
    assert tenants.resolve("Bearer tok-batchco").over_priority == OverPriority.LOWER
    assert tenants.resolve("Bearer tok-plain") == Tenant("default", Priority.VIP)
    assert tenants.resolve("Bearer nope") is None and tenants.resolve(None) is None
    assert tenants.names == ("acme", "batchco", "default")


@pytest.mark.parametrize("text", ["tok max_priority=gold", "tok colour=red", "tok tenant", "# only comments\n"])
def test_a_bad_tenants_file_is_an_error_naming_the_line(tmp_path, text):
    path = tmp_path / "tenants"
    path.write_text(text)
    with pytest.raises(TenantsFileError):
        read_tenants(str(path))


def test_a_tenant_above_its_class_is_refused_or_lowered():
    capped = Tenant("t", Priority.NORMAL)
    assert capped.priority_for(Priority.BATCH) == Priority.BATCH
    with pytest.raises(PermissionDenied, match="NORMAL"):
        capped.priority_for(Priority.VIP)
    assert Tenant("t", Priority.BATCH, OverPriority.LOWER).priority_for(Priority.VIP) == Priority.BATCH


def test_without_a_file_everyone_is_anonymous_and_capped():
    tenants = open_tenants()
    assert tenants.resolve(None).name == "anonymous"
    with pytest.raises(PermissionDenied):
        tenants.resolve("Bearer anything").priority_for(Priority.VIP)


def _admit(servicer, priority, token=None):
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    request = pb.GenerateRequest(text="Hello", priority=priority)
    return asyncio.run(servicer.admit(metadata, WireAsk(request), None)).job


def test_the_router_admits_by_tenant(tenants):
    frontend = Frontend(load_tokenizer(None), Limits(49152, 8192))
    s = Gateway(frontend, flow=None, traces=lambda md: FakeTrace(), drain=Drain(), tenants=tenants)
    try:
        job = _admit(s, pb.PRIORITY_VIP, "tok-acme")
        assert (job.tenant, job.priority) == ("acme", Priority.VIP)
        assert _admit(s, pb.PRIORITY_VIP, "tok-batchco").priority == Priority.BATCH
        with pytest.raises(Unauthenticated):
            _admit(s, pb.PRIORITY_NORMAL, "wrong")
        s.active = {f"a{i}": _Active(_Running(), None, "acme") for i in range(2)}
        with pytest.raises(OverloadedError, match="acme"):
            _admit(s, pb.PRIORITY_NORMAL, "tok-acme")
        assert _admit(s, pb.PRIORITY_NORMAL, "tok-plain").tenant == "default"
    finally:
        frontend.close()


class _Running:
    """A pump task still running."""

    def cancelling(self):
        return 0

    def done(self):
        return False
