"""greenroom's bench harness: ``python -m bench SCENARIO``.

Every figure that compares is a ratio to a baseline measured in the same run,
repeat by repeat (this machine is shared and noisy); each row reports the
median, min and max over the repeats.
"""
