"""Scale-out on Ray Serve (the optional ``mmserve[ray]`` extra): engine replicas behind one
OpenAI ingress, routed by image affinity with a load bound. Only ``flags`` and ``rendezvous``
import without Ray; nothing outside this package imports the rest."""
