"""The notebook face: HTML cards and DataFrames of results (:mod:`.display`), the chat playground and
quantization toggle widgets (:mod:`.widgets`), throughput and quantization measurements (:mod:`.bench`)
and their plots (:mod:`.plots`), and the check of the extra a notebook needs (:mod:`.extras`).  It knows
only the public surface below it (engine, session, tools, and generation's sampling parameters)."""
