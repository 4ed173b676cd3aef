"""One stream of every kind, with report rows inside (GOOD_ROWS) and outside (BAD_ROWS) each mechanism's support
(for test_validate.py, test_estimate.py and test_decode.py). Numeric, vector and Haar rows are grid indices
(SPEC §3.0): their real-valued rows are the old release, refused as off the grid."""

SUPPORT_STREAMS = {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
    "mem": {"kind": "vector", "mechanism": "ksampling", "params": {"epsilon": 1.0, "d": 3},
            "dims": ["a", "b", "c"], "bounds": [[0, 1]] * 3},
    "rec": {"kind": "haar", "params": {"epsilon": 2.0, "d": 3, "mean_mechanism": "piecewise",
                                       "detail_mechanism": "duchi_md", "split": 0.5},
            "dims": ["a", "b", "c"], "bounds": [[0, 1]] * 3},
    "os": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": 1.0, "k": 4}, "dims": ["os"]},
    "app": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 1.0, "k": 4}, "dims": ["app"]},
    "web": {"kind": "frequency", "mechanism": "olh", "params": {"epsilon": 1.0, "k": 4}, "dims": ["web"]},
    "geo": {"kind": "longitudinal", "mechanism": "lgrr", "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4},
            "dims": ["geo"]},
    "lang": {"kind": "longitudinal", "mechanism": "loloha",
             "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4, "g": 3}, "dims": ["lang"]},
}
GOOD_ROWS = {"cpu": 7, "mem": [0, 5, 0], "rec": {"mean": 3, "detail": [1, 0, 1]}, "os": 3,
             "app": [0, 1, 1, 0], "web": [12345, 2], "geo": 0, "lang": [77, 2]}
BAD_ROWS = {
    "cpu": [40000, -1, [1], 0.25],  # off the grid, a wrong shape, a real number (the old raw-double release)
    "mem": [[0, 40000, 0], [1, 2], [0, 0, 0, 0], [0.0, 1.5, 0.0]],
    "rec": [{"mean": 99999, "detail": [1, 1, 1]}, {"mean": 1, "detail": [1, 5, 1]},
            {"mean": 1, "detail": [1, 1]}, {"mean": 0.3, "detail": [0.1, -0.1, 0.0]}],
    "os": [4, -1, 1.5, [1]],
    "app": [[0, 2, 0, 0], [0, 1, 0], [0.5, 0, 0, 0]],
    "web": [[1, 99], [-1, 0], [1, 2, 3], 5],
    "geo": [4, -1, 2.5],
    "lang": [[1, 3], [1], [1, -1]],
}
