"""What the server tells every client at the handshake (shared by the server and the stdio proxy)."""

INSTRUCTIONS = """\
kope-mcp is a kernel-optimisation workbench. The loop: list_tasks -> get_task(task_id) -> write a kernel (C for
this CPU by default; backend="triton" or "cuda" for the tasks list_tasks marks) -> compile_kernel(task_id, source,
backend) -> run_tests(kernel_id) -> profile_kernel(kernel_id) -> improve and repeat, passing session_id (and
parent_id for the kernel you started from). Correctness comes first: only a kernel that
passed run_tests is profiled. Compile errors and wrong answers are normal results, not failures of the tool.
Every outcome is recorded in a shared experience graph: call query_experience(query, session_id=...) before each
new attempt to get the fixes, wins and pitfalls most relevant to where you are, and record_experience to add
the lesson of a step.
"""
