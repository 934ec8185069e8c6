"""Async handles: a name stays taken until its caller has seen the op finish."""

import os
import time

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402

import hvdcompat as hvd  # noqa: E402


def test_repeated_name_is_refused_until_the_first_handle_is_synchronized():
    n = hvd.size()
    t = torch.ones(4)
    first = hvd.allreduce_async(t, name="held", op=hvd.Sum)
    # Let the engine finish the first op: the refusal must not depend on it.
    hvd.allreduce(torch.ones(1), name="held.flush")
    time.sleep(0.05)
    with pytest.raises(ValueError, match="same name as another tensor"):
        hvd.allreduce_async(t, name="held", op=hvd.Sum)
    with pytest.raises(ValueError, match="same name as another tensor"):
        hvd.allreduce_async_(t.clone(), name="held", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(first), torch.full((4,), float(n)))
    again = hvd.allreduce_async(t, name="held", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(again), torch.full((4,), float(n)))


def test_poll_returning_true_frees_the_name():
    n = hvd.size()
    first = hvd.allgather_async(torch.tensor([hvd.rank()]), name="polled")
    while not hvd.poll(first):
        time.sleep(0.001)
    second = hvd.allgather_async(torch.tensor([hvd.rank() + 10]), name="polled")
    assert hvd.synchronize(second).tolist() == [r + 10 for r in range(n)]
    assert hvd.synchronize(first).tolist() == list(range(n))


def test_the_same_name_on_different_process_sets_is_independent():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a second rank")
    mine = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    theirs = hvd.add_process_set([r for r in range(n) if r % 2 == 1])
    this = mine if r % 2 == 0 else theirs
    on_global = hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum)
    on_set = hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum, process_set=this)
    assert hvd.synchronize(on_set).tolist() == [float(this.size())] * 2
    assert hvd.synchronize(on_global).tolist() == [float(n)] * 2
    hvd.remove_process_set(theirs)
    hvd.remove_process_set(mine)


def test_a_second_thread_waiting_on_the_same_handle_fails_clearly():
    import threading

    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a second rank")
    # Rank r waits on op "tw.<r+1>", which rank r+1 submits last, after a
    # pause: both of rank r's threads are waiting when it completes.
    handles = {k: hvd.allreduce_async(torch.full((3,), float(k)), name=f"tw.{k}", op=hvd.Sum)
               for k in range(n) if k != r}
    watched = (r + 1) % n
    outcomes = []

    def waiter():
        try:
            outcomes.append(("result", hvd.synchronize(handles[watched])))
        except ValueError as e:
            outcomes.append(("error", str(e)))

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    handles[r] = hvd.allreduce_async(torch.full((3,), float(r)), name=f"tw.{r}", op=hvd.Sum)
    for t in threads:
        t.join(60)
    kinds = sorted(kind for kind, _ in outcomes)
    assert kinds == ["error", "result"], outcomes
    result = next(v for kind, v in outcomes if kind == "result")
    assert result.tolist() == [float(n * watched)] * 3
    error = next(v for kind, v in outcomes if kind == "error")
    assert f"'allreduce.tw.{watched}'" in error and "another thread" in error, error
    for k, h in handles.items():
        if k != watched:
            assert hvd.synchronize(h).tolist() == [float(n * k)] * 3


def test_handles_never_synchronized_are_reported_at_shutdown(capfd):
    for k in range(3):
        hvd.allreduce_async(torch.ones(2), name=f"forgotten.{k}", op=hvd.Sum)
    hvd.allreduce(torch.ones(1), name="forgotten.flush")  # the three finish first
    capfd.readouterr()
    hvd.shutdown()
    err = capfd.readouterr().err
    hvd.init()
    assert "3 operation(s) finished but were never synchronized" in err, err
    assert "'allreduce.forgotten.0', 'allreduce.forgotten.1', 'allreduce.forgotten.2'" in err, err
