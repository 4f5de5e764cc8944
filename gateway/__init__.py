"""The FAST gateway: REST status and control of a run, Prometheus metrics and a dashboard.

It is stateless: every answer comes from the broker and the learner over gRPC, through the
fast.v1 protos only (it imports the generated stubs and fast/, never another service's code).
`gateway.app.create_app` builds the FastAPI app; `gateway.server.serve` runs it under uvicorn.
"""
