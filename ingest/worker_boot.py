"""Imported first by the decoding workers' forkserver (workpool.worker_pool) when the main
process settled pyarrow's pandas probe (the console script), so every worker forked from it
starts with pyarrow settled on working without pandas (lifecycle says why)."""

from ranklens.ingest.lifecycle import skip_pandas_probe

skip_pandas_probe()
