"""llama-server's own routes, so tools written for llama-server work unchanged: /infill
(code completion for editors), /rerank, and the inspection routes /props, /slots,
/apply-template (with ``?model=``, as its router mode)."""
