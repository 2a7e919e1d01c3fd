"""Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses).

A plain `def`: the runtime runs it in a worker thread, so even a slow expression would not stall other threads. It
also refuses work that would be huge: integers past `MAX_BITS` bits (a power is checked before it is computed).
"""

import ast
import operator

from pydantic import BaseModel, Field

from app.spec import BlockingState, define_tool

OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class Args(BaseModel):
    expression: str = Field(description="An arithmetic expression, e.g. `2 + 2 * 3`", max_length=200)


MAX_BITS = 4096  # the largest integer (about 1,230 digits) this tool computes


def _checked(value: float) -> float:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise ValueError("the result is too large")
    return value


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return _checked(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > 100:
                raise ValueError("exponent too large")
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > MAX_BITS:
                raise ValueError("the result is too large")
        return _checked(OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return _checked(OPERATORS[type(node.op)](_eval(node.operand)))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


@define_tool(description="Evaluate an arithmetic expression and return the result.", timeout=10)
def calculate(state: BlockingState, args: Args) -> str:
    value = _eval(ast.parse(args.expression, mode="eval"))
    return str(int(value) if float(value).is_integer() else value)
