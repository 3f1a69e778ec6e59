"""`accelify verify`: run a script and its conversion side by side and show they train the same.

`probe` runs inside the child processes (it imports torch); everything else here runs in the
parent and does not.
"""
