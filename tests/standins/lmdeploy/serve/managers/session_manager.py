"""Stand-in: lmdeploy.serve.managers.session_manager (Session / SessionManager)."""

import itertools

import _standin


class Session:
    def __init__(self, session_id, mgr):
        self.session_id = session_id
        self._mgr = mgr
        self._handle = None

    async def async_abort(self):
        if self._handle is not None:  # as LMDeploy: only a session with a running request is cancelled
            self._handle.cancelled = True
            _standin.record("lmdeploy", "abort", request_id=self.session_id)


class SessionManager:
    def __init__(self):
        self._ids = itertools.count(1)
        self.sessions = {}
        self.loop = None

    def get(self, session_id=None, **kwargs):
        sid = session_id if session_id is not None else next(self._ids)
        return self.sessions.setdefault(sid, Session(sid, self))

    def remove(self, session):
        self.sessions.pop(getattr(session, "session_id", session), None)

    def attach_event_loop(self, loop):
        self.loop = loop
