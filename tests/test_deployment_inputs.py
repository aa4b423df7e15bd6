"""A Flower deployment's meta-inputs (issue 80): every entry but `none` is refused in one line that says why (fitting
one needs every seen client's statistics in one place; each site keeps its own), before anything is written."""

from __future__ import annotations

import pytest

from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.flower import app as flower_app
from fedl2p_cli.stages import meta_train

from .helpers import handed


@pytest.mark.parametrize("norm", ["standardize", "robust"])
def test_a_deployment_refuses_a_fitted_meta_inputs_entry_in_one_line(norm, tmp_path):
    cfg = meta_train.MetaTrainConfig(input_norm=norm)
    with pytest.raises(FedL2PError) as e:
        flower_app.run_config(tmp_path / "store", None, cfg, 2, tmp_path / "out", handed())
    assert str(e.value).startswith(f"--input-norm {norm}: a deployment takes only 'none'") and "\n" not in str(e.value)
    assert "each site keeps its own" in str(e.value) and not (tmp_path / "out").exists()
