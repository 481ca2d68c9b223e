"""``python -m bench.audit_insert`` measures the audit batch on a server of its own, bounded and on 127.0.0.1."""

from __future__ import annotations

import pytest

from bench import audit_insert


def test_it_measures_the_shipped_statement_then_each_variant(capsys):
    results = audit_insert.main(["--fill", "500", "--rows", "5", "--reps", "3", "--variant", "nofk",
                                 "--variant", "drop:ix_calls_org_id_tool_name_created_at", "--variant", "randomids"])
    assert [label for label, _ in results] == ["as shipped", "+ nofk", "+ drop:ix_calls_org_id_tool_name_created_at",
                                               "+ randomids"]
    for _, figures in results:
        assert figures["wall_median_ms"] > 0
        assert figures["backend_cpu_ms_per_batch"] >= 0
    assert "backend CPU" in capsys.readouterr().out


@pytest.mark.parametrize("variant", ["fsync", "drop:ix; DROP TABLE calls"])
def test_an_unknown_variant_is_refused_before_a_server_starts(variant, capsys):
    with pytest.raises(SystemExit):
        audit_insert.main(["--variant", variant])
    assert "unknown variant" in capsys.readouterr().err
