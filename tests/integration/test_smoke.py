import leaseq


def test_enqueue_claim_complete(queue: leaseq.Queue) -> None:
    job_id = queue.enqueue("ocr", "extract", {"doc": 1}).job_id
    [job] = queue.claim(["ocr"], "w1")
    assert job.id == job_id
    result = queue.complete(job.lease, {"ok": True})
    assert isinstance(result, leaseq.Completed)
