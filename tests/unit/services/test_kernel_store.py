from kope_mcp.services.kernel_store import KernelRecord, KernelStore, new_id, now


def make_record(session_id: str) -> KernelRecord:
    return KernelRecord(kernel_id=new_id("k"), session_id=session_id, task_id="relu", backend="c", build_hash="h",
                        flags=[], ok=True, uses_openmp=False, created_at=now())


def test_everything_acknowledged_is_there_after_a_restart(tmp_path):
    store = KernelStore(tmp_path)
    session = store.create_session("relu")
    record = make_record(session.session_id)
    store.add_kernel(record)
    store.set_outcome(record.kernel_id, "test", {"passed": True, "failure": None, "message": "ok"})
    reopened = KernelStore(tmp_path)
    assert reopened.kernel(record.kernel_id).test == {"passed": True, "failure": None, "message": "ok"}
    assert reopened.session(session.session_id).kernel_ids == [record.kernel_id]
    assert reopened.latest_in_session(session.session_id).kernel_id == record.kernel_id


def test_a_torn_last_line_from_a_crash_is_ignored(tmp_path):
    store = KernelStore(tmp_path)
    session = store.create_session("relu")
    with (tmp_path / "journal.jsonl").open("a") as fh:
        fh.write('{"event": "kernel", "rec')
    reopened = KernelStore(tmp_path)
    assert reopened.session(session.session_id).task_id == "relu"
    later = reopened.create_session("dot")
    assert KernelStore(tmp_path).session(later.session_id).task_id == "dot"
