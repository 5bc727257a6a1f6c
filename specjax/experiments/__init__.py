"""The paper's experiments: reproduction, report and figures."""

