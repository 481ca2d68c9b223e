"""/table/ and the public demo: tokens.scope, orgs.public_demo, calls.demo, demo_calls

A token's scope (`full`, `table`: GETs of /table/ only, `demo`: the public demo's calls only), whether
an org runs as a public demo, whether a call was a demo call, and the demo's sliding hour per client
address (docs/sharing.md).

Revision ID: 0018
Revises: 0017
"""
from alembic import op
import sqlalchemy as sa

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tokens', sa.Column('scope', sa.String(length=16), server_default=sa.text("'full'"),
                                      nullable=False))
    op.create_check_constraint(op.f('ck_tokens_scope'), 'tokens', "scope IN ('full', 'table', 'demo')")
    op.add_column('orgs', sa.Column('public_demo', sa.Boolean(), server_default=sa.text('false'), nullable=False))
    op.add_column('calls', sa.Column('demo', sa.Boolean(), server_default=sa.text('false'), nullable=False))
    op.create_table('demo_calls',
    sa.Column('call_id', sa.String(length=64), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('client', sa.String(length=64), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_demo_calls_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('call_id', name=op.f('pk_demo_calls'))
    )
    op.create_index(op.f('ix_demo_calls_org_id_client_at'), 'demo_calls', ['org_id', 'client', 'at'], unique=False)
    op.create_index(op.f('ix_demo_calls_at'), 'demo_calls', ['at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_demo_calls_at'), table_name='demo_calls')
    op.drop_index(op.f('ix_demo_calls_org_id_client_at'), table_name='demo_calls')
    op.drop_table('demo_calls')
    op.drop_column('calls', 'demo')
    op.drop_column('orgs', 'public_demo')
    op.drop_constraint(op.f('ck_tokens_scope'), 'tokens', type_='check')
    op.drop_column('tokens', 'scope')
