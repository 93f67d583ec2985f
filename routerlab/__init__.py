"""RouterLab: see and steer dynamic depth (Router-Tuning) in language models, with real skipping."""

from .checkpoint import load_routers, resolve_routers, save_routers
from .config import GenerateConfig, RoutingConfig, default_layers
from .engine import Control, Engine
from .errors import RouterLabError
from .models import load_model, tiny_model
from .routed import attach_routers, detach_routers
from .router import Router, RouterSet
from .trace import Step, Trace, savings

__all__ = [
    "Control", "Engine", "GenerateConfig", "Router", "RouterLabError", "RouterSet", "RoutingConfig", "Step",
    "Trace", "attach_routers", "default_layers", "detach_routers", "load_model", "load_routers",
    "resolve_routers", "save_routers", "savings", "tiny_model",
]
