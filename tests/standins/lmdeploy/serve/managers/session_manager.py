"""Stand-in: lmdeploy.serve.managers.session_manager (Session / SessionManager)."""

import itertools

import _standin


class Session:
    def __init__(self, session_id, mgr):
        self.session_id = session_id
        self._mgr = mgr
        self._handle = None  # set while a request holds one of the engine's request handles

    async def async_abort(self):
        if self._handle is not None:  # as LMDeploy: only a session with a running request is cancelled
            self._handle.cancelled = True
            _standin.record("lmdeploy", "abort", request_id=self.session_id)


class SessionManager:
    def __init__(self):
        self.session_id_generator = itertools.count(0)  # LMDeploy numbers sessions from 0
        self.sessions = {}
        self.loop = None

    def get(self, session_id=None, create_if_not_exists=True, **kwargs):
        if not create_if_not_exists:
            return self.sessions.get(session_id)
        sid = session_id if session_id is not None else next(self.session_id_generator)
        return self.sessions.setdefault(sid, Session(sid, self))

    def remove(self, session):
        """Idempotent, as LMDeploy's: the engine's generate and the caller may both remove a session."""
        if session is None:
            return
        sid = getattr(session, "session_id", session)
        current = self.sessions.get(sid)
        if current is not None and not isinstance(session, int) and current is not session:
            return
        self.sessions.pop(sid, None)

    def clear(self):
        self.sessions.clear()
        self.session_id_generator = itertools.count(0)

    def attach_event_loop(self, loop):
        self.loop = loop
