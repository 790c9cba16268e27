import pytest

from pdserve.transfer import TransferRejected
from pdserve.transfer.descriptors import merge_runs
from pdserve.transfer.ledger import Ledger


def test_admit_lookup_and_remove():
    ledger = Ledger(16)
    ledger.admit("t", 0, merge_runs([(0, 1), (1, 2)]), "piece")
    assert ledger.lookup("t", 0) == "piece" and ledger.pieces_of("t") == ["piece"]
    ledger.remove("t", 0)
    ledger.remove("t", 0)
    assert ledger.lookup("t", 0) is None and len(ledger) == 0


@pytest.mark.parametrize(
    "transfer_id,seq,pairs",
    [("t", 0, [(0, 9)]), ("u", 0, [(0, 2)]), ("u", 0, [(0, 16)])],
    ids=["same piece", "overlapping blocks", "outside the pool"],
)
def test_refusals(transfer_id, seq, pairs):
    ledger = Ledger(16)
    ledger.admit("t", 0, merge_runs([(0, 1), (1, 2)]), "live")
    with pytest.raises(TransferRejected):
        ledger.admit(transfer_id, seq, merge_runs(pairs), "new")
    assert len(ledger) == 1


def test_retired_ids_are_refused_and_blocks_freed_by_remove_are_reusable():
    ledger = Ledger(16, retired_capacity=2)
    ledger.admit("t", 0, merge_runs([(0, 1)]), "p")
    ledger.remove("t", 0)
    ledger.retire("t")
    with pytest.raises(TransferRejected):
        ledger.admit("t", 1, merge_runs([(0, 5)]), "p")
    ledger.admit("u", 0, merge_runs([(0, 1)]), "reuses block 1")
    ledger.retire("v")
    ledger.retire("w")
    ledger.admit("t", 1, merge_runs([(0, 5)]), "t aged out of the bounded retired set")
