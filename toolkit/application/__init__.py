"""The application's side: handlers registered by name, the context they get, what they spend.

``app`` is the registry (:class:`App`), ``context`` what a call learns
(:class:`EffectContext`), ``handlers`` a registered handler and its signature checks,
``spend`` the accounting of budgeted resources across concurrent calls.
"""

from toolkit.application.app import App
from toolkit.application.context import EffectContext
from toolkit.application.handlers import Handler, HandlerFunc
from toolkit.application.spend import SpendLedger, SpendLimits, SpendMeter

__all__ = [
    "App", "EffectContext", "Handler", "HandlerFunc", "SpendLedger", "SpendLimits",
    "SpendMeter",
]  # fmt: skip
