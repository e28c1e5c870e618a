"""``reload(vw_args)`` on every single-process class: the new model serves
the calls after the switch, calls around it never fail or mix models, and a
reload that cannot start leaves the old model serving."""

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from subwabbit import (AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess,
                       VowpalWabbitDummyFormatter, VowpalWabbitError,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitPool, VowpalWabbitProcess,
                       VowpalWabbitStartupError)

from conftest import (PYTHON, STUBBORN_ENGINE, DictFormatter, common, in_child, items,
                      proc_stat, process_gone, scoring_args, wait_until)

SYNC = {"blocking": VowpalWabbitProcess, "nonblocking": VowpalWabbitNonBlockingProcess}


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_reload_switches_models_between_calls_from_other_threads(
        kind, trained_model, second_model, truth):
    model = SYNC[kind](DictFormatter(), scoring_args(trained_model))
    try:
        old_pid = model.pid
        stop = threading.Event()
        errors, served = [], []

        def worker():
            while not stop.is_set():
                try:
                    got = list(model.predict(common(1), items(3000), timeout=0.050))
                except Exception as exc:  # pylint: disable=broad-except
                    errors.append(repr(exc))
                    return
                if got == truth[trained_model][1][:len(got)]:
                    served.append(0)
                elif got == truth[second_model][1][:len(got)]:
                    served.append(1)
                else:
                    errors.append(("mixed or wrong", len(got)))

        thread = threading.Thread(target=worker)
        thread.start()
        time.sleep(0.2)
        model.reload(scoring_args(second_model))
        time.sleep(0.2)
        stop.set()
        thread.join(30)
        assert errors == []
        assert 0 in served and 1 in served
        assert served == sorted(served)  # never back to the old model
        assert list(model.predict(common(2), items(3000))) == truth[second_model][2]
        assert model.pid != old_pid and process_gone(old_pid)
        assert model.restart_count == 0
        assert "-i" in model.argv and second_model in model.argv
    finally:
        model.close()


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_a_reload_that_cannot_start_leaves_the_old_model(kind, trained_model, truth, tmp_path):
    with SYNC[kind](DictFormatter(), scoring_args(trained_model)) as model:
        pid = model.pid
        with pytest.raises(VowpalWabbitStartupError):
            model.reload(["-i", str(tmp_path / "missing.vw"), "-t", "--quiet"])
        assert model.pid == pid
        assert list(model.predict(common(3), items(3000))) == truth[trained_model][3]


def test_reload_mends_a_failed_process(trained_model, second_model, truth):
    with VowpalWabbitNonBlockingProcess(DictFormatter(), scoring_args(trained_model)) as model:
        model.vw_process.kill()
        with pytest.raises(VowpalWabbitError):
            list(model.predict(common(1), items(3000)))
        with pytest.raises(VowpalWabbitError):
            list(model.predict(common(1), items(3)))
        model.reload(scoring_args(second_model))
        assert list(model.predict(common(1), items(3000))) == truth[second_model][1]


def test_asyncio_reload_with_tasks_calling_meanwhile(trained_model, second_model, truth):
    async def main():
        async with AsyncVowpalWabbitProcess(DictFormatter(),
                                            scoring_args(trained_model)) as model:
            old_pid = model.pid
            stop = False
            served = []

            async def caller():
                while not stop:
                    got = await model.predict(common(4), items(3000), timeout=0.050)
                    if not got:
                        pass  # (a loaded machine's: no model to tell)
                    elif got == truth[trained_model][4][:len(got)]:
                        served.append(0)
                    else:
                        assert got == truth[second_model][4][:len(got)]
                        served.append(1)
                    await asyncio.sleep(0)

            async def served_by(which):
                # (waited for, not slept: a loaded machine's calls may all
                # return nothing for a while)
                deadline = time.monotonic() + 20
                while which not in served and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)

            task = asyncio.ensure_future(caller())
            await served_by(0)
            await model.reload(scoring_args(second_model))
            await served_by(1)
            stop = True
            await task
            assert 0 in served and 1 in served and served == sorted(served)
            with pytest.raises(VowpalWabbitStartupError):
                await model.reload(["-i", "/nonexistent/model.vw", "-t", "--quiet"])
            assert await model.predict(common(5), items(3000)) == truth[second_model][5]
            assert model.restart_count == 0
            return old_pid

    old_pid = asyncio.run(main())
    assert process_gone(old_pid)


@pytest.mark.parametrize("how", ["restart", "reload", "close"])
@pytest.mark.parametrize("kind", sorted(SYNC))
def test_an_unfinished_iterator_raises_after_its_engine_is_let_go(kind, how, trained_model,
                                                                  second_model, truth):
    # The new engine gets the old one's descriptor numbers (restart), or a file
    # opened after close() does: an iterator begun before must never read them.
    model = SYNC[kind](DictFormatter(), scoring_args(trained_model), batch_size=10)
    try:
        unfinished = model.predict(common(1), items(3000))
        first = next(unfinished)
        assert first == pytest.approx(truth[trained_model][1][0], abs=1e-6)
        opened = None
        if how == "restart":
            model.restart()
        elif how == "reload":
            model.reload(scoring_args(second_model))
        else:
            model.close()
            opened = open(trained_model, "rb")  # may take the freed descriptors
        got = [first]
        try:  # what had arrived before is its own; then it raises
            with pytest.raises(VowpalWabbitError, match="this call cannot go on: the process"):
                for value in unfinished:
                    got.append(value)
        finally:
            if opened is not None:
                opened.close()
        assert len(got) < 3000
        assert got == pytest.approx(truth[trained_model][1][:len(got)], abs=1e-6)
        if how != "close":  # the next call is exact, on the engine it should be on
            now = trained_model if how == "restart" else second_model
            assert list(model.predict(common(2), items(3000))) == pytest.approx(
                truth[now][2], abs=1e-6)
    finally:
        model.close()


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_an_iterator_begun_before_a_fork_raises_in_the_child(kind, trained_model, truth):
    model = SYNC[kind](DictFormatter(), scoring_args(trained_model), batch_size=10)
    try:
        unfinished = model.predict(common(1), items(3000))
        first = next(unfinished)

        def child():
            got = [first]
            try:
                for value in unfinished:
                    got.append(value)
            except VowpalWabbitError as exc:
                resumed = str(exc).splitlines()[0]
            else:
                resumed = "no error"
            return [resumed, got, list(model.predict(common(2), items(3000)))]

        result = in_child(child)
        assert "error" not in result, result
        resumed, got, served = result["ok"]
        assert resumed.startswith("this call cannot go on: the process was forked"), resumed
        assert len(got) < 3000
        assert got == pytest.approx(truth[trained_model][1][:len(got)], abs=1e-6)
        assert served == pytest.approx(truth[trained_model][2], abs=1e-6)
        # the parent's own iterator goes on, on the parent's engine
        assert [first] + list(unfinished) == pytest.approx(truth[trained_model][1], abs=1e-6)
    finally:
        model.close()


@pytest.mark.parametrize("kind", ["blocking", "nonblocking", "asyncio", "pool", "asyncio-pool"])
def test_a_reload_reads_the_model_header_once_and_the_asyncio_classes_off_the_loop(
        kind, trained_model, second_model, truth, monkeypatch):
    # The header says what kind of model the file is. It used to be read twice
    # per reload, the second time while calls waited for the switch, and on
    # the event loop by the asyncio classes (a file on a slow disk stalls
    # every task).
    import subwabbit.client
    real, reads = subwabbit.client.saved_options_of, []

    def recording(vw_args):
        reads.append(threading.get_ident())
        return real(vw_args)

    if kind in SYNC or kind == "pool":
        model = (VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1)
                 if kind == "pool" else SYNC[kind](DictFormatter(), scoring_args(trained_model)))
        with model:
            monkeypatch.setattr(subwabbit.client, "saved_options_of", recording)
            model.reload(scoring_args(second_model))
            assert list(model.predict(common(5), items(3000))) == truth[second_model][5]
        assert len(reads) == 1
        return

    async def main():
        model = (AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1)
                 if kind == "asyncio-pool"
                 else AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model)))
        async with model:
            monkeypatch.setattr(subwabbit.client, "saved_options_of", recording)
            await model.reload(scoring_args(second_model))
            assert await model.predict(common(5), items(3000)) == truth[second_model][5]
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(reads) == 1 and reads[0] != loop_thread


def _three_models(tmp_path):
    """Three small models; the first two score the items alike, the third
    the other way round."""
    paths = [str(tmp_path / f"v{n}.vw") for n in (1, 2, 3)]
    for path, sign in zip(paths, (1, 1, -1)):
        with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path],
                                 write_only=True) as trainer:
            for _ in range(20):
                trainer.train("|u x", ["|i a", "|i b"], labels=[sign, -sign], weights=[None, None])
    return paths


def _as_a_new_process_predicts(model_path, parts):
    """What a process started on ``model_path`` predicts for ``parts``."""
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                             ["-i", model_path, "-t", "--quiet"]) as fresh:
        return list(fresh.predict("|u x", parts))


def test_overlapping_reloads_of_a_thread_pool_serve_the_last_one_asked_for(tmp_path):
    # Found by a review: reloads ran side by side, and the one whose engines
    # started last served, though another was asked for after it.
    v1, v2, v3 = _three_models(tmp_path)
    parts = ["|i a", "|i b"]
    with VowpalWabbitPool(VowpalWabbitDummyFormatter(), ["-i", v1, "-t", "--quiet"],
                          size=1) as pool:
        spawn = pool._spawn  # pylint: disable=protected-access

        def slow_for_v2(argv, vw_args, count):
            if v2 in vw_args:
                time.sleep(0.5)  # a large model loading
            return spawn(argv, vw_args, count)

        pool._spawn = slow_for_v2  # pylint: disable=protected-access
        first = threading.Thread(target=pool.reload, args=(["-i", v2, "-t", "--quiet"],))
        first.start()
        time.sleep(0.1)
        pool.reload(["-i", v3, "-t", "--quiet"])  # asked for last
        newest = pool.predict("|u x", parts)
        first.join(30)
        assert pool.predict("|u x", parts) == newest, pool.vw_args
        assert v3 in pool.vw_args


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_overlapping_reloads_of_a_single_process_serve_the_last_one_asked_for(kind, tmp_path):
    # Found by a review: a single process switched to each reload's engine
    # as soon as it had started, so the reload whose engine started last
    # served, though another was asked for after it.
    v1, v2, v3 = _three_models(tmp_path)
    parts = ["|i a", "|i b"]
    with SYNC[kind](VowpalWabbitDummyFormatter(), ["-i", v1, "-t", "--quiet"]) as model:
        start = model._start_engine  # pylint: disable=protected-access

        def slow_for_v2(on_spawn=None, argv=None, probes_teach=None):
            if argv is not None and v2 in argv:
                time.sleep(0.5)  # a large model loading
            return start(on_spawn, argv, probes_teach)

        model._start_engine = slow_for_v2  # pylint: disable=protected-access
        first = threading.Thread(target=model.reload, args=(["-i", v2, "-t", "--quiet"],))
        first.start()
        time.sleep(0.1)
        model.reload(["-i", v3, "-t", "--quiet"])  # asked for last
        first.join(30)
        newest = list(model.predict("|u x", parts))
        assert v3 in model.vw_args, model.vw_args
        assert newest[0] < newest[1]  # v3 scores the items the other way round
        assert newest == pytest.approx(_as_a_new_process_predicts(v3, parts), abs=1e-6)


def test_overlapping_reloads_of_an_asyncio_process_serve_the_last_one_asked_for(tmp_path):
    # As the sync classes (found by a review: the older model served in 6
    # of 10 runs): each reload switched once its own engine had started.
    v1, v2, v3 = _three_models(tmp_path)
    parts = ["|i a", "|i b"]

    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                            ["-i", v1, "-t", "--quiet"]) as model:
            start = model._start_engine  # pylint: disable=protected-access

            async def slow_for_v2(argv=None, probes_teach=None):
                if argv is not None and v2 in argv:
                    await asyncio.sleep(0.5)  # a large model loading
                return await start(argv, probes_teach)

            model._start_engine = slow_for_v2  # pylint: disable=protected-access
            first = asyncio.ensure_future(model.reload(["-i", v2, "-t", "--quiet"]))
            await asyncio.sleep(0.1)
            await model.reload(["-i", v3, "-t", "--quiet"])  # asked for last
            await first
            return await model.predict("|u x", parts), model.vw_args

    newest, vw_args = asyncio.run(main())
    assert v3 in vw_args, vw_args
    assert newest == pytest.approx(_as_a_new_process_predicts(v3, parts), abs=1e-6)


def test_overlapping_reloads_of_an_asyncio_pool_serve_the_last_one_asked_for(tmp_path):
    v1, v2, v3 = _three_models(tmp_path)
    parts = ["|i a", "|i b"]

    async def main():
        async with AsyncVowpalWabbitPool(VowpalWabbitDummyFormatter(),
                                         ["-i", v1, "-t", "--quiet"], size=1) as pool:
            spawn = pool._spawn  # pylint: disable=protected-access

            async def slow_for_v2(argv, vw_args, count):
                if v2 in vw_args:
                    await asyncio.sleep(0.5)
                return await spawn(argv, vw_args, count)

            pool._spawn = slow_for_v2  # pylint: disable=protected-access
            first = asyncio.ensure_future(pool.reload(["-i", v2, "-t", "--quiet"]))
            await asyncio.sleep(0.1)
            await pool.reload(["-i", v3, "-t", "--quiet"])
            newest = await pool.predict("|u x", parts)
            await first
            return newest, await pool.predict("|u x", parts), pool.vw_args

    newest, final, vw_args = asyncio.run(main())
    assert final == newest and v3 in vw_args, vw_args


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_close_ends_the_engine_a_reload_replaced_within_its_own_timeout(kind, tmp_path):
    """reload() closes the old engine in the background within its own
    timeout; an engine that ignores EOF and SIGTERM went on running after a
    close() with a shorter timeout had returned (until the reload's SIGKILL)."""
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(STUBBORN_ENGINE)
    model = SYNC[kind](VowpalWabbitDummyFormatter(), ["--quiet"],
                       vw_command=[PYTHON, str(stubborn)])
    old_pid = model.pid
    try:
        model.reload(["--quiet"], timeout=30.0)
        assert proc_stat(old_pid) is not None  # still closing
        began = time.perf_counter()
        model.close(timeout=1.0)
        assert time.perf_counter() - began < 1.0 + 0.5
        # Killed by close() (not by the reload's schedule, 30 s on): gone in
        # moments, though a loaded machine may not have run its exit by the
        # time close() returns.
        assert process_gone(old_pid, timeout_s=5.0)
    finally:  # (never left running)
        with contextlib.suppress(ProcessLookupError):
            os.kill(old_pid, signal.SIGKILL)


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool", "asyncio"])
def test_close_ends_the_engine_a_reload_replaced_within_its_own_timeout_asyncio_and_pools(
        kind, tmp_path):
    """As above, for the pools (an old engine no call holds is closed on
    another thread) and the asyncio class (a task closes it)."""
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(STUBBORN_ENGINE)
    options = {"vw_command": [PYTHON, str(stubborn)]}
    if "pool" in kind:
        options.update(size=1, share_weights=False)
    classes = {"pool": VowpalWabbitPool, "asyncio-pool": AsyncVowpalWabbitPool,
               "asyncio": AsyncVowpalWabbitProcess}
    model = classes[kind](VowpalWabbitDummyFormatter(), ["--quiet"], **options)
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete if kind.startswith("asyncio") else (lambda result: result)
    if kind.startswith("asyncio"):
        run(model.start())
    old_pids = model.engine_pids() if "pool" in kind else [model.pid]
    try:
        run(model.reload(["--quiet"], timeout=30.0))
        assert [pid for pid in old_pids if proc_stat(pid) is None] == []  # still closing
        began = time.perf_counter()
        run(model.close(timeout=1.0))
        assert time.perf_counter() - began < 1.0 + 0.5
        # (as above: killed by close(), gone in moments)
        assert [pid for pid in old_pids if not process_gone(pid, timeout_s=5.0)] == []
    finally:  # (never left running)
        for pid in old_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        loop.close()


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool"])
def test_close_ends_the_fork_server_a_reload_retired_within_its_own_timeout(
        kind, trained_model, second_model):
    """The old model's fork server, stopped (SIGSTOP) so that it cannot exit
    within the reload's timeout, is ended by a close() with a shorter one:
    it went on running after close() had returned, until the reload's
    SIGKILL (and the thread pool's reload() waited for it)."""
    classes = {"pool": VowpalWabbitPool, "asyncio-pool": AsyncVowpalWabbitPool}
    pool = classes[kind](DictFormatter(), scoring_args(trained_model), size=2)
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete if kind.startswith("asyncio") else (lambda result: result)
    server = None
    try:
        if kind.startswith("asyncio"):
            run(pool.start())
        server = pool._groups[0].server.pid  # pylint: disable=protected-access
        os.kill(server, signal.SIGSTOP)
        if kind.startswith("asyncio"):
            run(pool.reload(scoring_args(second_model), timeout=30.0))
        else:  # (it returns once the old fork server has exited)
            threading.Thread(target=pool.reload, args=(scoring_args(second_model), 30.0),
                             daemon=True).start()
            assert wait_until(lambda: pool.generation == 1)
        assert proc_stat(server) is not None  # still closing
        began = time.perf_counter()
        run(pool.close(timeout=1.0))
        assert time.perf_counter() - began < 1.0 + 0.5
        assert process_gone(server, timeout_s=0.5)
    finally:  # (never left running)
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)
        loop.close()
