"""Progress in a log: LineProgress prints a line at the start, at most every interval, and at the
end, with an ETA from the rate so far (long jobs in pods and CI must not look silent)."""

import io

from qpart.progress import LineProgress, progress_bars


def test_a_task_prints_at_start_then_throttled_then_at_completion(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("qpart.progress.time.monotonic", lambda: now[0])
    out = io.StringIO()
    with LineProgress(out, interval=10) as bar:
        task = bar.add_task("tables", total=4)
        for step in range(1, 5):
            now[0] += 4
            bar.update(task, completed=step)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tables: 0/4 (0.0%) elapsed 0:00:00 ETA ?"
    # 4 s a step: only the step at 12 s passes the 10 s interval before the last one
    assert lines[1:] == ["tables: 3/4 (75.0%) elapsed 0:00:12 ETA 0:00:04",
                         "tables: 4/4 (100.0%) elapsed 0:00:16 ETA 0:00:00"]


def test_fields_and_an_unknown_total_are_shown(monkeypatch):
    out = io.StringIO()
    with LineProgress(out, interval=0) as bar:
        task = bar.add_task("training m", total=None, loss="")
        bar.update(task, completed=2, total=10, loss="loss 1.234")
    assert out.getvalue().splitlines()[-1].startswith("training m: 2/10 (20.0%) elapsed")
    assert out.getvalue().splitlines()[-1].endswith("loss 1.234")


def test_an_unfinished_task_prints_its_last_state_on_exit(monkeypatch):
    out = io.StringIO()
    with LineProgress(out, interval=3600) as bar:
        task = bar.add_task("check", total=10)
        bar.update(task, completed=7)
    assert out.getvalue().splitlines()[-1].startswith("check: 7/10 (70.0%)")


def test_off_a_terminal_the_bars_are_lines(capsys):
    with progress_bars() as bar:
        bar.update(bar.add_task("x", total=1), completed=1)
    assert isinstance(bar, LineProgress)
    assert "x: 1/1 (100.0%)" in capsys.readouterr().err


def test_completion_is_printed_once_and_never_past_100_percent(monkeypatch):
    out = io.StringIO()
    with LineProgress(out, interval=3600) as bar:
        task = bar.add_task("done", total=4)
        for _ in range(5):
            bar.update(task, completed=4)
        bar.update(task, completed=6)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("done: 4/4 (100.0%)")
