"""Servers and test models for tests and benchmarks alike.

Modules: serve (a real tritonserver on the fixture models, or on the project's hf model: make_repository, serve,
hf_server, the variants helpers benchmarks compare models with), processes (a tritonserver's process tree and the
CPU each role uses), sigterm (a benchmark's SIGTERM unwinds like Ctrl-C).  models/ holds the fixture models
(timed, emitter, first_echo, frontend_echo, frontend_marker): python-backend models that follow launcher/contract.py
with a known behaviour, each `<name>/config.pbtxt` + `<name>/1/model.py`, shipped as package data.
"""
