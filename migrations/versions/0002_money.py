"""money: balances, credit grants, holds, daily spend, member caps, tag budgets, idempotency keys

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('credit_grants',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('amount_micro', sa.BigInteger(), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_credit_grants_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_credit_grants'))
    )
    op.create_index('ix_credit_grants_org_id_created_at', 'credit_grants', ['org_id', 'created_at'], unique=False)
    op.create_table('holds',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('member_id', sa.String(length=40), nullable=True),
    sa.Column('tag', sa.String(length=200), nullable=True),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('amount_micro', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=16), server_default=sa.text("'held'"), nullable=False),
    sa.Column('settled_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("state IN ('held', 'settled', 'released')", name=op.f('ck_holds_state')),
    sa.CheckConstraint('amount_micro > 0 AND settled_micro >= 0 AND settled_micro <= amount_micro', name=op.f('ck_holds_amounts')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_holds_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_holds'))
    )
    op.create_index('ix_holds_expires_at_open', 'holds', ['expires_at'], unique=False, postgresql_where=sa.text("state = 'held'"))
    op.create_index('ix_holds_org_id_created_at', 'holds', ['org_id', 'created_at'], unique=False)
    op.create_table('idempotency_keys',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('label', sa.String(length=255), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('claim_id', sa.String(length=40), nullable=False),
    sa.Column('call_id', sa.String(length=200), nullable=True),
    sa.Column('status', sa.Integer(), nullable=True),
    sa.Column('headers', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('body', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("state IN ('in_progress', 'done')", name=op.f('ck_idempotency_keys_state')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_idempotency_keys_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', 'label', name=op.f('pk_idempotency_keys'))
    )
    op.create_index('ix_idempotency_keys_expires_at', 'idempotency_keys', ['expires_at'], unique=False)
    op.create_table('money_daily',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('scope', sa.String(length=40), nullable=False),
    sa.Column('spent_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('held_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_money_daily_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', 'day', 'scope', name=op.f('pk_money_daily'))
    )
    op.create_table('org_balances',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('granted_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('settled_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('held_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('trial_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('daily_cap_micro', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('granted_micro >= settled_micro + held_micro', name=op.f('ck_org_balances_covered')),
    sa.CheckConstraint('held_micro >= 0 AND settled_micro >= 0', name=op.f('ck_org_balances_non_negative')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_org_balances_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', name=op.f('pk_org_balances'))
    )
    op.create_table('tag_budgets',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('tag', sa.String(length=200), nullable=False),
    sa.Column('budget_micro', sa.BigInteger(), nullable=True),
    sa.Column('spent_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('held_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_tag_budgets_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', 'tag', name=op.f('pk_tag_budgets'))
    )
    op.create_table('member_caps',
    sa.Column('member_id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('daily_cap_micro', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['member_id'], ['members.id'], name=op.f('fk_member_caps_member_id_members'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_member_caps_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('member_id', name=op.f('pk_member_caps'))
    )
    # ### end Alembic commands ###

def downgrade() -> None:
    op.drop_table('member_caps')
    op.drop_table('tag_budgets')
    op.drop_table('org_balances')
    op.drop_table('money_daily')
    op.drop_index('ix_idempotency_keys_expires_at', table_name='idempotency_keys')
    op.drop_table('idempotency_keys')
    op.drop_index('ix_holds_org_id_created_at', table_name='holds')
    op.drop_index('ix_holds_expires_at_open', table_name='holds')
    op.drop_table('holds')
    op.drop_index('ix_credit_grants_org_id_created_at', table_name='credit_grants')
    op.drop_table('credit_grants')
